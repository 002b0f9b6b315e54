#!/usr/bin/env python3
"""Checks that ltrain's modules include only the modules ARCHITECTURE.md allows.

The allowed dependencies are the fenced block of ARCHITECTURE.md that opens with ```layers: one
line per module, `module -> other, other` (`module ->` for none), comments after `#`. A module is a
folder of src/ or include/ltrain/, and `app` (app/). Every `#include "ltrain/<other>/..."` in
src/<module>/, include/ltrain/<module>/ (and app/) must name the module itself or one listed on its
line. Fails, listing each include the block does not allow, each module of the code the block does
not mention, each module of the block the code lacks, and any cycle among the block's arrows.

    python3 tests/check_layers.py                # checks the source tree this file lies in
    python3 tests/check_layers.py --root DIR     # checks another tree
    python3 tests/check_layers.py --self-test    # shows it fails on a forbidden include

Exit codes: 0 the code follows the block, 1 it does not, 2 the block is missing or malformed.
Python 3 standard library only.
"""
import argparse
import os
import re
import sys
import tempfile

BLOCK_OPEN = re.compile(r"^```layers\s*$")
BLOCK_CLOSE = re.compile(r"^```\s*$")
LINE = re.compile(r"^([a-z_][a-z0-9_]*)\s*->\s*(.*)$")
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]ltrain/([^/">]+)/')
SOURCE_SUFFIXES = (".h", ".hpp", ".cuh", ".cpp", ".cc", ".cu", ".inl")


class BlockError(Exception):
    pass


def read_block(text):
    """The layers block of ARCHITECTURE.md's text: {module: set of modules it may include}."""
    lines = text.splitlines()
    opens = [i for i, line in enumerate(lines) if BLOCK_OPEN.match(line)]
    if len(opens) != 1:
        raise BlockError(f"ARCHITECTURE.md must hold exactly one ```layers block; it holds {len(opens)}")
    allowed = {}
    for number in range(opens[0] + 1, len(lines)):
        line = lines[number].split("#", 1)[0].strip()
        if BLOCK_CLOSE.match(lines[number]):
            break
        if not line:
            continue
        match = LINE.match(line)
        if not match:
            raise BlockError(f"ARCHITECTURE.md:{number + 1}: expected `module -> other, other`, got `{line}`")
        module, targets = match.group(1), match.group(2).strip()
        if module in allowed:
            raise BlockError(f"ARCHITECTURE.md:{number + 1}: {module} has a second line")
        allowed[module] = {t.strip() for t in targets.split(",") if t.strip()} if targets else set()
    else:
        raise BlockError("ARCHITECTURE.md: the ```layers block is not closed")
    for module, targets in sorted(allowed.items()):
        for target in sorted(targets - set(allowed)):
            raise BlockError(f"ARCHITECTURE.md: {module} -> {target}: {target} has no line of its own in the block")
    return allowed


def find_cycle(allowed):
    """One cycle among the arrows as a list of modules, or None."""
    state = {}  # 1: on the current path, 2: done

    def visit(module, path):
        state[module] = 1
        for target in sorted(allowed[module]):
            if target == module:
                continue
            if state.get(target) == 1:  # on the path: the path from it back to it is a cycle
                return path[path.index(target):] + [target]
            if target not in state:
                cycle = visit(target, path + [target])
                if cycle:
                    return cycle
        state[module] = 2
        return None

    for module in sorted(allowed):
        if module not in state:
            cycle = visit(module, [module])
            if cycle:
                return cycle
    return None


def module_folders(root):
    """{module: [folders holding its code]} for the tree at `root`."""
    folders = {}
    for parent in ("src", os.path.join("include", "ltrain")):
        base = os.path.join(root, parent)
        if not os.path.isdir(base):
            continue
        for name in sorted(os.listdir(base)):
            if os.path.isdir(os.path.join(base, name)):
                folders.setdefault(name, []).append(os.path.join(base, name))
    if os.path.isdir(os.path.join(root, "app")):
        folders.setdefault("app", []).append(os.path.join(root, "app"))
    return folders


def check(root):
    """The problems of the tree at `root`, one line each (empty: it follows the block), and the
    number of cross-module includes seen."""
    with open(os.path.join(root, "ARCHITECTURE.md"), encoding="utf-8") as f:
        allowed = read_block(f.read())
    folders = module_folders(root)
    problems = []
    for module in sorted(set(folders) - set(allowed)):
        problems.append(f"module {module} ({', '.join(os.path.relpath(p, root) for p in folders[module])}) "
                        f"has no line in ARCHITECTURE.md's layers block")
    for module in sorted(set(allowed) - set(folders)):
        problems.append(f"ARCHITECTURE.md's layers block names {module}, which has no folder in src/, "
                        f"include/ltrain/ or app/")
    cycle = find_cycle(allowed)
    if cycle:
        problems.append("ARCHITECTURE.md's layers block has a cycle: " + " -> ".join(cycle))
    seen = 0
    for module in sorted(folders):
        for folder in folders[module]:
            for directory, subdirs, files in os.walk(folder):
                subdirs.sort()
                for name in sorted(files):
                    if not name.endswith(SOURCE_SUFFIXES):
                        continue
                    path = os.path.join(directory, name)
                    with open(path, encoding="utf-8", errors="replace") as f:
                        for number, line in enumerate(f, 1):
                            match = INCLUDE.match(line)
                            if not match or match.group(1) == module:
                                continue
                            seen += 1
                            target = match.group(1)
                            where = f"{os.path.relpath(path, root)}:{number}"
                            if target not in folders:
                                problems.append(f"{where}: includes ltrain/{target}/, a module with no folder")
                            elif module in allowed and target not in allowed[module]:
                                problems.append(f"{where}: {module} includes ltrain/{target}/ but ARCHITECTURE.md "
                                                f"does not allow {module} -> {target}")
    return problems, seen


def run(root):
    try:
        problems, seen = check(root)
    except BlockError as error:
        print(f"check_layers: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        print(f"check_layers: {error}", file=sys.stderr)
        return 2
    if problems:
        for problem in problems:
            print(problem)
        print(f"check_layers: {len(problems)} problem(s); fix the include or ARCHITECTURE.md's layers block")
        return 1
    print(f"check_layers: {seen} includes across modules, all allowed by ARCHITECTURE.md")
    return 0


def self_test():
    """The checker on small trees: it passes a tree that follows its block and fails each way a
    tree can break it."""

    def tree(files):
        directory = tempfile.TemporaryDirectory(prefix="check_layers-")
        for path, text in files.items():
            full = os.path.join(directory.name, path)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "w", encoding="utf-8") as f:
                f.write(text)
        return directory

    block = "# A\n\n```layers\nio -> core   # io writes files\ncore ->\n```\n"
    good = {
        "ARCHITECTURE.md": block,
        "src/core/a.cpp": '#include "ltrain/core/a.h"\n',
        "include/ltrain/core/a.h": "#pragma once\n",
        "src/io/b.cpp": '#include "ltrain/io/b.h"\n#include "ltrain/core/a.h"\n',
        "include/ltrain/io/b.h": '#pragma once\n#include "ltrain/core/a.h"\n',
    }
    failures = []

    def expect(name, files, code, wanted):
        with tree(files) as root:
            try:
                problems, _ = check(root)
                got = 1 if problems else 0
            except BlockError as error:
                problems, got = [str(error)], 2
        if got != code or any(not any(w in p for p in problems) for w in wanted):
            failures.append(f"{name}: expected exit {code} naming {wanted}, got {got}: {problems}")

    expect("a tree that follows its block", good, 0, [])
    expect("a forbidden include", {**good, "src/core/c.cpp": '#include <vector>\n  #  include "ltrain/io/b.h"\n'}, 1,
           ["src/core/c.cpp:2: core includes ltrain/io/ but ARCHITECTURE.md does not allow core -> io"])
    expect("a forbidden include in a header", {**good, "include/ltrain/core/d.h": '#include <ltrain/io/b.h>\n'}, 1,
           ["include/ltrain/core/d.h:1: core includes ltrain/io/"])
    expect("a module the block does not mention", {**good, "src/extra/e.cpp": '#include "ltrain/core/a.h"\n'}, 1,
           ["module extra (src/extra) has no line"])
    expect("a module of the block with no folder",
           {**good, "ARCHITECTURE.md": block.replace("core ->", "core ->\nold -> core")}, 1,
           ["names old, which has no folder"])
    expect("a cycle", {**good, "ARCHITECTURE.md": block.replace("core ->", "core -> io")}, 1,
           ["has a cycle: core -> io -> core"])
    expect("an arrow to a module without a line",
           {**good, "ARCHITECTURE.md": block.replace("io -> core", "io -> core, data")}, 2,
           ["io -> data: data has no line"])
    expect("no block", {**good, "ARCHITECTURE.md": "# A\n"}, 2, ["exactly one ```layers block"])
    expect("a malformed line", {**good, "ARCHITECTURE.md": block.replace("core ->", "core depends on nothing")}, 2,
           ["expected `module -> other, other`"])
    if failures:
        for failure in failures:
            print(f"check_layers self-test: {failure}")
        return 1
    print("check_layers self-test: ok")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        help="the source tree to check (default: the one holding this script)")
    parser.add_argument("--self-test", action="store_true", help="check the checker on small trees")
    args = parser.parse_args()
    return self_test() if args.self_test else run(args.root)


if __name__ == "__main__":
    sys.exit(main())
