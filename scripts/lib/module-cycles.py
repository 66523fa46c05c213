#!/usr/bin/env python3
"""Finds circles of imports between the modules of each crate of the workspace, and fails on any.

A module (one file: `src/a/b.rs` or `src/a/b/mod.rs` is `a::b`) depends on another when it names it by a
path: `crate::x::y`, `super::y`, `self::y`, in a `use` (grouped ones expanded) or in code. A module naming
one of its own descendants is not counted: declaring and re-exporting children is how a module is built,
and a child naming its parent is the ordinary direction. What is left must form no circle: two siblings
that use each other (or a longer loop) are one piece of code split in two files, or a missing third
module that both should use.

Usage: module-cycles.py [WORKSPACE_DIR]   (prints each circle; exit 1 if there is one)
"""

import os
import re
import sys

WORD = r"[A-Za-z_][A-Za-z0-9_]*"
PATH = re.compile(r"\b(crate|super|self)((?:::" + WORD + r")+)")
USE = re.compile(r"\buse\s+([^;]*);", re.S)
LINE_COMMENT = re.compile(r"//[^\n]*")
BLOCK_COMMENT = re.compile(r"/\*.*?\*/", re.S)
STRING = re.compile(r'"(?:\\.|[^"\\])*"')


def crates(root):
    """Every crate directory of the workspace with a `src/`, skipping build output and vendored code."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [
            d
            for d in dirnames
            if not d.startswith(".") and d not in ("target", "node_modules", "corpus", "artifacts")
        ]
        if "Cargo.toml" in filenames and os.path.isdir(os.path.join(dirpath, "src")):
            yield dirpath


def modules(src):
    """Module path (tuple of names) -> file, for every .rs file under `src`."""
    found = {}
    for dirpath, _, filenames in os.walk(src):
        for name in filenames:
            if not name.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(dirpath, name), src)
            parts = rel[:-3].split(os.sep)
            if parts[-1] in ("mod", "lib", "main"):
                parts = parts[:-1]
            if parts and parts[0] == "bin":
                continue
            found[tuple(parts)] = os.path.join(dirpath, name)
    return found


def expand(tree):
    """The paths a `use` tree names: `a::{b, c::{d, e}}` -> a::b, a::c::d, a::c::e."""
    tree = re.sub(r"\s+", "", tree)
    brace = tree.find("{")
    if brace < 0:
        return [re.sub(r"\bas\w+$", "", tree)] if tree else []
    prefix, inner = tree[:brace], tree[brace + 1 : tree.rfind("}")]
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(inner):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(inner[start:i])
            start = i + 1
    parts.append(inner[start:])
    out = []
    for part in parts:
        if part in ("", "self"):
            out.append(prefix.rstrip(":"))
            continue
        out.extend(prefix + sub for sub in expand(part))
    return out


def resolve(module, head, rest, known):
    """The known module a path names, or None."""
    segments = [s for s in rest.split("::") if s]
    if head == "crate":
        base = []
    elif head == "self":
        base = list(module)
    else:
        base = list(module[:-1]) if module else []
        while segments and segments[0] == "super":
            segments.pop(0)
            base = base[:-1]
    candidate = tuple(base + segments)
    while candidate and candidate not in known:
        candidate = candidate[:-1]
    return candidate if candidate in known else ()


def edges(module, text, known):
    text = BLOCK_COMMENT.sub("", LINE_COMMENT.sub("", STRING.sub('""', text)))
    paths = []
    for use in USE.finditer(text):
        for path in expand(use.group(1)):
            path = re.sub(r"^::", "", path)
            m = re.match(r"(crate|super|self)((?:::" + WORD + r")*)", path)
            if m:
                paths.append((m.group(1), m.group(2)))
    for m in PATH.finditer(text):
        paths.append((m.group(1), m.group(2)))
    out = set()
    for head, rest in paths:
        target = resolve(module, head, rest, known)
        if target == module or target[: len(module)] == module:
            continue  # itself, or a descendant
        out.add(target)
    return out


def circles(graph):
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, result = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                result.append(sorted(component))

    sys.setrecursionlimit(10000)
    for v in list(graph):
        if v not in index:
            visit(v)
    return result


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    found = 0
    for crate in sorted(crates(root)):
        known = modules(os.path.join(crate, "src"))
        graph = {}
        for module, path in known.items():
            with open(path, encoding="utf-8") as f:
                graph[module] = edges(module, f.read(), known)
        for component in circles(graph):
            found += 1
            names = ", ".join("::".join(m) or "(crate root)" for m in component)
            print(f"{os.path.relpath(crate, root)}: a circle of imports between {names}")
            for module in component:
                into = sorted("::".join(t) or "(crate root)" for t in graph[module] if t in component)
                print(f"    {'::'.join(module) or '(crate root)'} uses {', '.join(into)}")
    if found:
        print(f"{found} circle(s) of imports; see scripts/lib/module-cycles.py for the rule")
        return 1
    print("no circle of imports in any crate")
    return 0


if __name__ == "__main__":
    sys.exit(main())
