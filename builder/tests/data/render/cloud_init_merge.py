#!/usr/bin/env python3
# Merges the cloud-config parts of (multipart) user data with cloud-init's own user-data
# processor and cloud-config part handler, as the init stage does, and writes the merged
# cloud-config to argv[2]. Run with Debian's python3 (the one that has cloudinit).
import os
import sys
import tempfile

from cloudinit import handlers, helpers, user_data, util
from cloudinit.handlers.cloud_config import CloudConfigPartHandler

data = open(sys.argv[1], "rb").read()
tmp = tempfile.mkdtemp()
paths = helpers.Paths({"cloud_dir": tmp, "run_dir": tmp})
message = user_data.UserDataProcessor(paths).process(data)
handler = CloudConfigPartHandler(paths)
handler.cloud_fn = sys.argv[2]
handler.handle_part(None, handlers.CONTENT_START, None, None, None, None)
for part in message.walk():
    if part.get_content_maintype() == "multipart":
        continue
    ctype = part.get_content_type()
    if ctype != "text/cloud-config":
        continue
    payload = util.fully_decoded_payload(part)
    handler.handle_part(None, ctype, part.get_filename(), payload, None, part)
handler.handle_part(None, handlers.CONTENT_END, None, None, None, None)
