#!/usr/bin/env python3
# Runs cloudbase-init's real user-data plugin on a file, with the one Windows-only piece (the
# OS utilities that would start powershell.exe) replaced by a recorder. Prints JSON.
import json, sys
from unittest import mock
from cloudbaseinit.metadata.services import base as services
from cloudbaseinit.plugins.common import userdata
from cloudbaseinit.osutils import factory

class FileService(services.BaseMetadataService):
    def __init__(self, path):
        super().__init__()
        self._path = path
    def _get_data(self, path):
        raise services.NotExistingMetadataException()
    def get_user_data(self):
        return open(self._path, 'rb').read()

runs = []
class Recorder:
    def execute_powershell_script(self, path, sysnative=True):
        runs.append({"executor": "powershell", "sysnative": sysnative, "script": open(path, encoding="utf-8").read()})
        return b"", b"", 0
    def execute_process(self, args, shell=True, **kw):
        runs.append({"executor": "process", "args": [str(a) for a in args]})
        return b"", b"", 0

with mock.patch.object(factory, "get_os_utils", return_value=Recorder()):
    service = FileService(sys.argv[1])
    status, reboot = userdata.UserDataPlugin().execute(service, {})
print(json.dumps({"status": status, "reboot": reboot, "runs": runs}))
