#!/usr/bin/env python3
"""Prints the import graph of one crate's source files and fails on a cycle.

    scripts/import-graph.py firstboot/src

Each file is a node (`foo/mod.rs` is `foo`, `foo/bar.rs` is `foo::bar`); an edge is a
`crate::…` or `super::…` path in the file's non-test code (comments and `mod tests` left
out). A parent declaring its child (`mod bar;`) is not an edge. Exit status 1 on a cycle.
"""
import os
import re
import sys


def modules(root):
    files = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            if not name.endswith(".rs"):
                continue
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)[:-3]
            mod = rel[: -len("/mod")] if rel.endswith("/mod") else rel
            mod = mod.replace(os.sep, "::")
            if mod not in ("lib", "main"):
                files[mod] = path
    return files


def code_of(path):
    src = re.sub(r"//[^\n]*", "", open(path, encoding="utf-8").read())
    cut = re.search(r"#\[cfg\((all\()?test[^\]]*\]\s*mod tests", src)
    return src[: cut.start()] if cut else src


def edges(files):
    def resolve(path):
        parts = path.split("::")
        for n in range(len(parts), 0, -1):
            cand = "::".join(parts[:n])
            if cand in files:
                return cand
        return None

    out = {}
    for mod, path in files.items():
        src = code_of(path)
        parent = "::".join(mod.split("::")[:-1])
        deps = {resolve(p) for p in re.findall(r"crate::((?:[a-z_][a-z0-9_]*::)*[a-z_][a-z0-9_]*)", src)}
        supers = re.findall(r"super::([a-z_][a-z0-9_]*)", src)
        supers += [n.strip().split("::")[0] for g in re.findall(r"super::\{([^}]*)\}", src) for n in g.split(",")]
        for name in supers:
            deps.add(resolve(f"{parent}::{name}" if parent else name) or parent or None)
        deps.discard(None)
        deps.discard(mod)
        out[mod] = sorted(deps)
    return out


def cycles(graph):
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

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
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            visit(v)
    return found


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    graph = edges(modules(sys.argv[1]))
    for mod in sorted(graph):
        print(f"{mod} -> {' '.join(graph[mod])}")
    found = cycles(graph)
    for c in found:
        print("cycle:", " <-> ".join(c), file=sys.stderr)
    sys.exit(1 if found else 0)


if __name__ == "__main__":
    main()
