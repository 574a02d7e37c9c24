"""CI: fail when an integration run (pytest's JUnit XML) failed, ran no test or skipped one.

With both frameworks' sources given, every integration test must run (none runs only
without Miles), so each skip fails CI; each is printed with its reason.
Usage: python .ci/skips.py JUNIT_XML
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET


def outcomes(junit_xml: str) -> tuple[int, int, list[tuple[str, str]]]:
    """The numbers of passed and failed (or errored) tests, and each skipped test's id and
    reason."""
    passed, failed, skipped = 0, 0, []
    for case in ET.parse(junit_xml).getroot().iter("testcase"):
        skip = case.find("skipped")
        if skip is not None:
            test = f"{case.get('classname')}::{case.get('name')}"
            skipped.append((test, skip.get("message", "")))
        elif case.find("failure") is not None or case.find("error") is not None:
            failed += 1
        else:
            passed += 1
    return passed, failed, skipped


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python .ci/skips.py JUNIT_XML", file=sys.stderr)
        return 2
    passed, failed, skipped = outcomes(argv[0])
    for test, why in skipped:
        print(f"ci: skipped: {test}: {why}")
    if passed + failed == 0:
        print("ci: no integration test ran")
    elif skipped:
        print(f"ci: {len(skipped)} integration tests skipped: each must run in CI")
    print(f"integration: {passed} passed, {failed} failed, {len(skipped)} skipped")
    return 1 if failed or skipped or passed + failed == 0 else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
