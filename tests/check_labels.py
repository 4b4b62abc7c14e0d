"""check_labels.py CTEST BUILD LABEL...: fails unless every test that CTEST lists in the build
folder BUILD carries exactly one of the LABELs (unit, oracle, e2e: tests/CMakeLists.txt).
A test executable not built yet (a partial build) is skipped."""
import json
import subprocess
import sys

ctest, build, kinds = sys.argv[1], sys.argv[2], set(sys.argv[3:])
listing = subprocess.run([ctest, "--show-only=json-v1"], cwd=build, check=True,
                         capture_output=True, text=True).stdout
bad = []
for test in json.loads(listing)["tests"]:
    if test["name"].endswith("_NOT_BUILT"):
        continue  # gtest_discover_tests' stand-in for an executable not built yet
    labels = []
    for prop in test.get("properties", []):
        if prop["name"] == "LABELS":
            labels = prop["value"]
    kind = [label for label in labels if label in kinds]
    if len(kind) != 1:
        bad.append("%s: %s" % (test["name"], ", ".join(labels) or "no labels"))
for line in bad:
    print(line)
print("%d test(s) without exactly one of %s" % (len(bad), ", ".join(sorted(kinds))))
sys.exit(1 if bad else 0)
