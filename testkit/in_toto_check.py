"""Checks an in-toto Statement v1 with a SLSA Provenance v1 predicate against the in-toto
project's own schemas (the in-toto-attestation package: protobuf messages and validators).

    in_toto_check.py STATEMENT.json | DSSE.json

A DSSE envelope's payload is checked. Unknown or misnamed fields, a missing digest, a wrong
_type or predicateType, and a predicate that is not SLSA Provenance v1 are errors (exit 1,
the reason on stderr). Used by builder/tests (issue 39); scripts/attest-tools.sh installs it.
"""
import base64
import json
import sys

from google.protobuf import json_format
from in_toto_attestation.v1 import statement_pb2
from in_toto_attestation.v1.resource_descriptor import ResourceDescriptor
from in_toto_attestation.v1.statement import Statement
from in_toto_attestation.predicates.provenance.v1 import provenance_pb2

SLSA = "https://slsa.dev/provenance/v1"


def main(path):
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    if "payloadType" in doc:
        if doc["payloadType"] != "application/vnd.in-toto+json":
            raise ValueError("DSSE payloadType %r" % doc["payloadType"])
        doc = json.loads(base64.b64decode(doc["payload"]))
    pb = json_format.ParseDict(doc, statement_pb2.Statement())
    Statement.copy_from_pb(pb).validate()
    if pb.predicate_type != SLSA:
        raise ValueError("predicateType %r, expected %r" % (pb.predicate_type, SLSA))
    prov = json_format.ParseDict(doc["predicate"], provenance_pb2.Provenance())
    bd = prov.build_definition
    if not bd.build_type:
        raise ValueError("buildDefinition.buildType is required")
    if not prov.run_details.builder.id:
        raise ValueError("runDetails.builder.id is required")
    for i, rd in enumerate(bd.resolved_dependencies):
        try:
            ResourceDescriptor.copy_from_pb(rd).validate()
        except ValueError as e:
            raise ValueError("resolvedDependencies[%d]: %s" % (i, e)) from e
    print("ok: %d subjects, %d resolved dependencies" % (len(pb.subject), len(bd.resolved_dependencies)))


if __name__ == "__main__":
    try:
        main(sys.argv[1])
    except (ValueError, KeyError, json_format.ParseError) as e:
        print("in_toto_check: %s: %s" % (sys.argv[1], e), file=sys.stderr)
        sys.exit(1)
