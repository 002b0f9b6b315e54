#!/usr/bin/env python3
"""Checks that README.zh-CN.md follows README.md section for section.

A section of README.md is a heading of level 2 or 3 (`## Data`) or a list item that opens with bold
text (`- **Resume**: ...`), up to the next one. Its Chinese counterpart is the part of README.zh-CN.md
that opens with a line carrying `<!-- en: NAME -->`, NAME the English heading or bold text, up to the
next such line. Every English section needs its counterpart, in README.md's order, and the counterpart
holds each of the section's commands (its code lines, comments after ` # ` and comment lines left out,
spaces collapsed) among its own code lines. README.zh-CN.md may have sections of its own in between
(lines without a marker). Fails naming each section without a counterpart, each counterpart out of
order or naming no section, and each command a counterpart lacks.

    python3 tests/check_readme_sections.py                # the tree this file lies in
    python3 tests/check_readme_sections.py --root DIR     # another tree
    python3 tests/check_readme_sections.py --self-test    # shows it fails on a missing or stale section

Exit codes: 0 the Chinese README follows, 1 it does not, 2 a README is missing.
Python 3 standard library only.
"""
import argparse
import os
import re
import sys

HEADING = re.compile(r"^(##|###) (.+?)\s*$")
BOLD_ITEM = re.compile(r"^- \*\*(.+?)\*\*")
MARKER = re.compile(r"<!-- en: (.+?) -->")
FENCE = re.compile(r"^\s*```")


def code_lines(lines):
    """The commands among LINES: lines of indented (4 spaces or more) or fenced code, without their
    trailing comments; comment lines left out."""
    commands, fenced = [], False
    for line in lines:
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced and not line.startswith("    "):
            continue
        text = re.split(r"\s+#(?:\s|$)", line.strip(), maxsplit=1)[0]
        text = " ".join(text.split())
        if text and not text.startswith("#"):
            commands.append(text)
    return commands


def english_sections(text):
    """[(name, commands)] of README.md, in order."""
    sections, fenced = [], False
    current = None
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        match = None if fenced else (HEADING.match(line) or BOLD_ITEM.match(line))
        if match:
            current = [match.group(match.lastindex), []]
            sections.append(current)
        elif current is not None:
            current[1].append(line)
    return [(name, code_lines(body)) for name, body in sections]


def chinese_sections(text):
    """[(name, commands, line number)] of README.zh-CN.md's marked parts, in order."""
    sections, current = [], None
    for number, line in enumerate(text.splitlines(), 1):
        match = MARKER.search(line)
        if match:
            current = [match.group(1).strip(), [], number]
            sections.append(current)
        elif current is not None:
            current[1].append(line)
    return [(name, code_lines(body), number) for name, body, number in sections]


def problems_of(english_text, chinese_text):
    english = english_sections(english_text)
    chinese = chinese_sections(chinese_text)
    names = [name for name, _ in english]
    by_name = {name: (commands, number) for name, commands, number in chinese}
    problems = []
    for name, _, number in chinese:
        if name not in names:
            problems.append(f"README.zh-CN.md:{number}: '<!-- en: {name} -->' names no section of README.md")
    previous = 0
    for name, commands in english:
        if name not in by_name:
            problems.append(f"README.md's section '{name}' has no counterpart in README.zh-CN.md (a part opening "
                            f"with '<!-- en: {name} -->')")
            continue
        zh_commands, number = by_name[name]
        if number < previous:
            problems.append(f"README.zh-CN.md:{number}: '{name}' comes before the section README.md has before it")
        previous = max(previous, number)
        for command in commands:
            if command not in zh_commands:
                problems.append(f"README.zh-CN.md:{number}: '{name}' lacks the command '{command}' of README.md")
    return problems


def self_test():
    english = ("# T\n\nintro\n\n## Start\n\nrun:\n\n    bash go.sh   # go\n\n## Using it\n\n"
               "- **Configs** are JSON.\n- **Resume**: like this\n\n      build/x resume\n")
    chinese = ("# T\n\n## 开始 <!-- en: Start -->\n\n    bash go.sh\n\n## 用法 <!-- en: Using it -->\n\n"
               "- **配置** <!-- en: Configs -->\n- **续训** <!-- en: Resume -->\n\n      build/x resume\n")
    failures = []
    if problems_of(english, chinese):
        failures.append(f"a faithful translation: {problems_of(english, chinese)}")
    cases = {
        "a missing section": (chinese.replace(" <!-- en: Resume -->", ""), "section 'Resume' has no counterpart"),
        "a stale marker": (chinese.replace("en: Configs", "en: Config files"), "names no section of README.md"),
        "a missing command": (chinese.replace("    bash go.sh\n", ""), "lacks the command 'bash go.sh'"),
        "another order": (chinese.replace("- **配置** <!-- en: Configs -->\n- **续训** <!-- en: Resume -->",
                                          "- **续训** <!-- en: Resume -->\n- **配置** <!-- en: Configs -->"),
                          "comes before the section"),
    }
    for what, (text, expected) in cases.items():
        found = problems_of(english, text)
        if not any(expected in problem for problem in found):
            failures.append(f"{what}: expected a problem with '{expected}', got {found}")
    for failure in failures:
        print(f"check_readme_sections --self-test: {failure}", file=sys.stderr)
    return 1 if failures else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parser.add_argument("--self-test", action="store_true")
    args = parser.parse_args()
    if args.self_test:
        return self_test()
    try:
        with open(os.path.join(args.root, "README.md"), encoding="utf-8") as f:
            english = f.read()
        with open(os.path.join(args.root, "README.zh-CN.md"), encoding="utf-8") as f:
            chinese = f.read()
    except OSError as exc:
        print(f"check_readme_sections: {exc}", file=sys.stderr)
        return 2
    problems = problems_of(english, chinese)
    for problem in problems:
        print(f"check_readme_sections: {problem}", file=sys.stderr)
    if not problems:
        print(f"check_readme_sections: README.zh-CN.md has a counterpart for each of README.md's "
              f"{len(english_sections(english))} sections")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
