"""Check every vector in signature_vectors.json with twilio's RequestValidator."""

import json, sys, pathlib, hashlib
from multidict import MultiDict
from twilio.request_validator import RequestValidator
import twilio

data = json.loads((pathlib.Path(__file__).parent / "signature_vectors.json").read_text())
print("twilio", twilio.__version__)
results = {}
for v in data["vectors"]:
    val = RequestValidator(v["auth_token"])
    if "body" in v:
        params = v["body"]
    elif "params_multi" in v:
        params = MultiDict(v["params_multi"])
    else:
        params = v["params"]
    extra = ""
    try:
        ok = val.validate(v["url"], params, v["expected_signature"])
    except Exception as e:  # twilio-python raises on a str body without bodySHA256
        ok = False
        extra += " (validate raised %s: treated as invalid)" % type(e).__name__
    if "expected_body_sha256_hex" in v:
        extra += " body_sha256_match=%s" % (
            hashlib.sha256(v["body"].encode()).hexdigest() == v["expected_body_sha256_hex"]
        )
    status = "PASS" if ok == v["expect_valid"] else "FAIL"
    results[v["id"]] = {"validate": ok, "expect_valid": v["expect_valid"], "status": status, "note": extra.strip()}
    print(f"{status}  {v['id']}: validate()={ok} expected={v['expect_valid']}{extra}")
(pathlib.Path(__file__).parent / "verification_results.json").write_text(
    json.dumps({"twilio_version": twilio.__version__, "results": results}, indent=2) + "\n"
)
sys.exit(0 if all(r["status"] == "PASS" for r in results.values()) else 1)
