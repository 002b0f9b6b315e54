#!/usr/bin/env python3
"""Checks that every ctest test carries exactly one of the labels unit, integration and cuda.

Reads the tests and their labels from `ctest -N --show-only=json-v1` run in the build folder, and
fails naming each test with none of the three or with more than one, and each entry of
tests/CMakeLists.txt's label lists that names no test (passed with --unused by the generated
labels file, tests/labels.cmake.in). tests/CMakeLists.txt says which label a test gets.

    python3 tests/check_test_labels.py --ctest ctest --build-dir build [--unused ENTRY...]
    python3 tests/check_test_labels.py --self-test

Exit codes: 0 every test has one label, 1 some do not, 2 ctest could not list the tests.
Python 3 standard library only.
"""
import argparse
import json
import subprocess
import sys

LABELS = ("unit", "integration", "cuda")


def problems_of(listing, unused):
    """The problems of a json-v1 listing (a dict), one line each, and the tests per label."""
    problems = []
    counts = {label: 0 for label in LABELS}
    for test in listing.get("tests", []):
        labels = []
        for prop in test.get("properties", []):
            if prop.get("name") == "LABELS":
                labels = [label for label in prop.get("value", []) if label in LABELS]
        if len(labels) == 1:
            counts[labels[0]] += 1
        elif not labels:
            problems.append(f"{test['name']}: none of the labels {', '.join(LABELS)} (tests/CMakeLists.txt "
                            f"says which one a test gets)")
        else:
            problems.append(f"{test['name']}: more than one of the labels: {', '.join(labels)}")
    for entry in unused:
        problems.append(f"{entry}: listed in tests/CMakeLists.txt's test labels but names no test")
    return problems, counts


def run(ctest, build_dir, unused):
    try:
        listing = subprocess.run([ctest, "-N", "--show-only=json-v1"], cwd=build_dir, check=True,
                                 capture_output=True, text=True).stdout
        listing = json.loads(listing)
    except (OSError, subprocess.CalledProcessError, json.JSONDecodeError) as error:
        print(f"check_test_labels: cannot list the tests with {ctest} in {build_dir}: {error}", file=sys.stderr)
        return 2
    problems, counts = problems_of(listing, unused)
    for problem in problems:
        print(problem)
    summary = ", ".join(f"{counts[label]} {label}" for label in LABELS)
    if problems:
        print(f"check_test_labels: {len(problems)} problem(s); labelled: {summary}")
        return 1
    print(f"check_test_labels: every test has one label: {summary}")
    return 0


def self_test():
    def test(name, *labels):
        return {"name": name, "properties": [{"name": "LABELS", "value": list(labels)}] if labels else []}

    listing = {"tests": [test("A.Unit", "unit"), test("A.Gpu_CUDA", "cuda", "extra"), test("B.Run", "integration")]}
    failures = []
    problems, counts = problems_of(listing, [])
    if problems or counts != {"unit": 1, "integration": 1, "cuda": 1}:
        failures.append(f"a labelled listing: {problems} {counts}")
    listing["tests"] += [test("C.None"), test("C.Other", "slow"), test("C.Two", "unit", "integration")]
    problems, _ = problems_of(listing, ["D.Gone"])
    wanted = ["C.None: none of", "C.Other: none of", "C.Two: more than one", "D.Gone: listed"]
    if len(problems) != len(wanted) or any(not p.startswith(w) for p, w in zip(problems, wanted)):
        failures.append(f"an unlabelled listing: {problems}")
    for failure in failures:
        print(f"check_test_labels self-test: {failure}")
    if not failures:
        print("check_test_labels self-test: ok")
    return 1 if failures else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ctest", default="ctest", help="the ctest to list the tests with")
    parser.add_argument("--build-dir", default="build", help="the build folder")
    parser.add_argument("--unused", nargs="*", default=[], help="label list entries that named no test")
    parser.add_argument("--self-test", action="store_true", help="check the checker on made-up listings")
    args = parser.parse_args()
    return self_test() if args.self_test else run(args.ctest, args.build_dir, [u for u in args.unused if u])


if __name__ == "__main__":
    sys.exit(main())
