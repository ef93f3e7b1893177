#!/usr/bin/python3
# Structure figures of tiermem's C++ sources, for refactoring notes.
#   tools/code-stats.py [--rev REV] [--class NAME]... [--json]
# Reads *.cpp *.hpp *.h *.cu *.cuh of the product folders (not tests, bench, fuzz,
# build) at git revision REV, or in the working tree (tracked and untracked,
# non-ignored files) without --rev, and prints:
# 1. Function lengths: every function definition (free, out-of-line member,
#    member body inline in a class body; no lambdas), in lines from the first
#    line of its signature (a `template <...>` before it left out) to its closing
#    brace: count, median, p90 (nearest rank), max, and the ten longest.
# 2. Class sizes (--class, default AddressSpace, RequestHandler, ClientCore):
#    the lines of its member function definitions (`NAME::f` out of line plus
#    bodies inline in `class NAME {`; nested classes' members not counted), how
#    many member functions its class body declares, and the files involved.
# 3. Hand-built requests: declarations `proto::Request x;`, `x{...}` and
#    `x = <expression>` outside parameter lists; copies of another variable
#    (`= request;`, `= std::move(request)`) and relays of one with the
#    asker's identity (`= Authoriser::relayed(request, ...)`) left out.
# Heuristics: a brace-matching parser, no compiler. Comments, string and char
# literals and preprocessor lines are blanked first (both branches of an #if
# are read). A `{` opens a function body when the tokens before it (since the
# last `;`, `{`, `}` or access label) end in `)`, after const, noexcept,
# override, final, &, &&, mutable, `-> type` or a constructor's initialiser list
# are dropped, and the name before that `(` is no control keyword (if, for,
# while, switch, catch) and no lambda's `]`; a `{` like that inside a function
# body is a block (`MACRO(i, n) {`). Heads starting with namespace, class,
# struct, union or enum open scopes; names are qualified by enclosing classes
# only. A member function declaration is a statement of a class body with a
# name followed by `(` outside `<...>` and before any `=` or `{` (no friend,
# static_assert or `= delete`). Function-like macros without a `;` confuse it.
import argparse, bisect, json, os, pathlib, re, statistics, subprocess, sys

PRODUCT = set("common proto pages tiers mapping transport access daemon client executor tools include".split())
SOURCE = re.compile(r"\.(cpp|hpp|h|cu|cuh)$")
TOKEN = re.compile(r"[A-Za-z_]\w*|\d[\w.']*|::|->|&&|\.\.\.|\S")
IDENT = re.compile(r"[A-Za-z_]\w*$")
CONTROL = {"if", "for", "while", "switch", "catch", "constexpr", "return", "sizeof", "alignof",
           "decltype", "noexcept", "static_assert", "new", "delete", "throw", "typeid", "alignas"}
TRAILERS = {"const", "volatile", "noexcept", "override", "final", "&", "&&", "mutable", "constexpr", "try", "..."}
SCOPES = {"namespace", "class", "struct", "union", "enum"}
OPEN, CLOSE = {"(": ")", "[": "]", "{": "}"}, {")": "(", "]": "[", "}": "{"}


def git(repo, *args):
    return subprocess.run(["git", "-C", repo, *args], check=True, capture_output=True).stdout


def list_files(repo, rev):
    lists = [["ls-files"], ["ls-files", "--others", "--exclude-standard"]]
    lists = [["ls-tree", "-r", "--name-only", rev]] if rev else lists
    names = [n for args in lists for n in git(repo, *args).decode().splitlines()]
    return sorted({n for n in names if n.split("/")[0] in PRODUCT and SOURCE.search(n)})


def read(repo, rev, name):  # None for a file deleted in the working tree but not in the index
    if rev:
        return git(repo, "show", f"{rev}:{name}").decode("utf-8", "replace")
    path = pathlib.Path(repo, name)
    return path.read_text(encoding="utf-8", errors="replace") if path.is_file() else None


LEXICAL = re.compile(r"""//[^\n]* | /\*.*?\*/ | ^[ \t]*\#(?:\\\n|[^\n])*
  | (?P<lit>\b(?:u8|u|U|L)?R"(?P<d>[^(\s]*)\(.*?\)(?P=d)"      # raw string
           | (?:\b(?:u8|u|U|L))?"(?:\\.|[^"\\\n])*"             # string
           | (?:\b(?:u8|u|U|L)|(?<!\w))'(?:\\.|[^'\\\n])+')""",  # char; not 1'000
                     re.S | re.M | re.X)


def blank(text):
    """Comments, preprocessor lines and literals (as "") blanked, newlines kept."""
    lit = lambda m: 2 if m.group("lit") else 0  # noqa: E731
    return LEXICAL.sub(lambda m: '""'[:lit(m)] + re.sub(r"[^\n]", " ", m.group())[lit(m):], text)


class Unit:
    """One file: tokens, their lines, matching brackets, and the kind of each `{`."""

    def __init__(self, name, text):
        self.name, self.text = name, blank(text)
        starts = [0] + [m.end() for m in re.finditer("\n", self.text)]
        found = list(TOKEN.finditer(self.text))
        self.toks = [m.group() for m in found]
        self.line = [bisect.bisect_right(starts, m.start()) for m in found]
        self.match, stack = [-1] * len(self.toks), []
        for i, t in enumerate(self.toks):
            if t in OPEN:
                stack.append(i)
            elif t in CLOSE and stack and self.toks[stack[-1]] == CLOSE[t]:
                j = stack.pop(); self.match[i], self.match[j] = j, i
        self.kind, self.scope, self.functions = {}, {}, []
        self.parse()

    def t(self, i):
        return self.toks[i] if 0 <= i < len(self.toks) else ""

    def head_start(self, i):
        """First token of the declaration or statement that the `{` at i opens."""
        j = i - 1
        while j >= 0:
            t = self.toks[j]
            if t in (";", "{", "(", "[") or (t == "}" and self.kind.get(self.match[j]) != "init") or \
                    (t == ":" and self.t(j - 1) in ("public", "private", "protected")):
                break
            j = self.match[j] - 1 if t in CLOSE and self.match[j] >= 0 else j - 1
        return j + 1

    def angle_match(self, k, step):
        """Index of the `<` or `>` matching the one at k, walking by step (+1 or -1)."""
        depth = 0
        while 0 <= k < len(self.toks):
            depth += {"<": step, ">": -step}.get(self.toks[k], 0)
            if depth == 0:
                return k
            k = self.match[k] if self.toks[k] in (OPEN if step > 0 else CLOSE) and self.match[k] >= 0 else k
            k += step
        return k

    def name_before(self, q):
        """(name, index of its first token) of the name ending at token q, the one before a `(`."""
        k = None
        if self.t(q) == ")" and self.t(q - 1) == "(" and self.t(q - 2) == "operator":
            name, k = "operator()", q - 2
        else:
            for j in range(q, max(q - 6, -1), -1):
                if self.toks[j] == "operator":  # operator==, operator[], operator bool, ...
                    name, k = "operator" + "".join(" " + t if IDENT.match(t) else t for t in self.toks[j + 1:q + 1]), j
                    break
                if self.toks[j] in ";{}(),":
                    break
        if k is None:
            if self.t(q) == ">":
                q = self.angle_match(q, -1) - 1
            if not IDENT.match(self.t(q)):
                return None  # a lambda's `]`, a cast, ...
            name, k = self.toks[q], q
            if self.t(k - 1) == "~":
                name, k = "~" + name, k - 1
        while self.t(k - 1) == "::":  # Class::, Class<T>::, ns::
            j = k - 2
            if self.t(j) == ">":
                j = self.angle_match(j, -1) - 1
            if not IDENT.match(self.t(j)):
                break
            name, k = self.toks[j] + "::" + name, j
        return name, k

    def signature(self, start, end):
        """Name of the function whose head is toks[start:end] (the tokens before its `{`), else None."""
        k, j = end - 1, start
        while j < end:  # a trailing return type: from the last top-level `->`
            if self.toks[j] == "->":
                k = j - 1
            j = self.match[j] + 1 if self.toks[j] in OPEN and start <= self.match[j] < end else j + 1
        while k >= start:  # trailers: const, noexcept(...), override, ...
            if self.toks[k] in TRAILERS:
                k -= 1
            elif self.toks[k] == ")" and self.t(self.match[k] - 1) == "noexcept":
                k = self.match[k] - 2
            else:
                break
        if self.t(k) not in (")", "}") or not start <= self.match[k] < k:
            return None
        p = self.match[k]
        got = self.name_before(p - 1)
        if got is None or got[0].split("::")[-1] in CONTROL:
            return None
        q = got[1] - 1
        if q >= start and self.toks[q] in (",", ":"):  # an element of a constructor's initialiser list
            while q > start and self.toks[q] != ":":
                q = self.match[q] - 1 if self.toks[q] in CLOSE and self.match[q] >= start else q - 1
            return self.signature(start, q) if q > start else None
        return got[0] if self.toks[p] == "(" else None

    def parse(self):
        stack = []  # (kind, name) of the open braces
        for i, t in enumerate(self.toks):
            if t == "}" and stack:
                stack.pop()
            if t != "{":
                continue
            start = self.head_start(i)
            while self.t(start) == "template" and self.t(start + 1) == "<":  # template <...> prefix
                start = min(self.angle_match(start + 1, 1) + 1, i)
            head = self.toks[start:i]
            first = next((h for h in head if h not in ("typedef", "inline", "export", "static")), "")
            kind, name = "block", None
            if first in SCOPES:  # its name: the last identifier before `:`, `<` or `(`
                rest = head[head.index(first) + 1:] + [":"]
                rest = rest[:min(rest.index(c) for c in ":<(" if c in rest)]
                kind, name = first, ([h for h in rest if IDENT.match(h) and h not in ("final", "class")] or ["?"])[-1]
            elif head and (name := self.signature(start, i)) is not None:
                # no function is defined in a function (outside a local class): `MACRO(i, n) {` is a loop
                inner = next((k for k, _ in reversed(stack) if k in ("function", "class", "struct", "union")), "")
                kind = "block" if inner == "function" else "function"
            elif head and (IDENT.match(head[-1]) and head[-1] not in ("do", "else", "try")
                           or head[-1] in (">", "=", ",")):
                kind = "init"  # `T x{...}`, `= {...}`, `return {...}`
            self.kind[i] = kind
            self.scope[i] = name
            if kind == "function":
                classes = [n for k, n in stack if k in ("class", "struct", "union")]
                qual = "::".join(classes + [name])
                cls = name.split("::")[-2] if "::" in name else (classes[-1] if classes else None)
                end = self.match[i] if self.match[i] >= 0 else len(self.toks) - 1
                self.functions.append({"file": self.name, "line": self.line[start], "name": qual, "class": cls,
                                       "lines": self.line[end] - self.line[start] + 1})
            stack.append((kind, name))

    def declared_methods(self, cls):
        """Names of the member functions declared in the body of `class cls {` (heuristic, see the header)."""
        found, stmts = set(), []
        for i in (i for i, kind in self.kind.items() if kind in ("class", "struct") and self.scope[i] == cls):
            stmt, k = [], i + 1
            while k < self.match[i]:  # split the body into statements (a body or a `;` ends one)
                if self.toks[k] in ("public", "private", "protected") and self.t(k + 1) == ":":
                    k += 2; continue
                stmt.append(k)
                if self.toks[k] == ";" or self.kind.get(k) == "function":
                    stmts.append(stmt); stmt = []
                k = self.match[k] + 1 if self.toks[k] in OPEN and self.match[k] >= 0 else k + 1
        for stmt in stmts:
            toks, angle = [self.toks[k] for k in stmt], 0
            if toks[0] in ("friend", "using", "static_assert", "typedef") or toks[0] in SCOPES or \
                    any(t == "delete" and toks[n - 1] == "=" for n, t in enumerate(toks)):
                continue
            for n, k in enumerate(stmt):
                angle += {"<": 1, ">": -1}.get(toks[n], 0)
                if toks[n] in ("=", "{"):
                    break
                if toks[n] == "(" and angle <= 0 and n > 0:
                    got = self.name_before(k - 1)
                    if got and got[0] not in CONTROL:
                        found.add(got[0])
                    break
        return found


def hand_built(unit):
    toks, found = unit.toks, []
    for i in range(1, len(toks) - 4):
        if toks[i:i + 3] != ["proto", "::", "Request"] or not IDENT.match(toks[i + 3]):
            continue
        before = toks[i - 2] if toks[i - 1] == "const" else toks[i - 1]
        if before not in (";", "{", "}", ")", ":") or toks[i + 4] not in (";", "{", "="):
            continue  # a parameter, a return type, a template argument
        rest = toks[i + 5:i + 9] + ["", ""]
        if toks[i + 4] == "=" and (IDENT.match(rest[0]) and rest[1] == ";" or rest[:4] == ["std", "::", "move", "("]
                                    or rest[:3] == ["Authoriser", "::", "relayed"]):
            continue  # a copy of another request
        found.append(unit.line[i])
    return found


def main():
    ap = argparse.ArgumentParser(description="Structure figures of the C++ sources (see the header).")
    ap.add_argument("--rev", help="git revision (default: the working tree)")
    ap.add_argument("--class", dest="classes", action="append", metavar="NAME")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--repo", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    args = ap.parse_args()
    classes = args.classes or ["AddressSpace", "RequestHandler", "ClientCore"]
    texts = ((name, read(args.repo, args.rev, name)) for name in list_files(args.repo, args.rev))
    units = [Unit(name, text) for name, text in texts if text is not None]
    funcs = [f for u in units for f in u.functions]
    lengths = sorted(f["lines"] for f in funcs) or [0]
    longest = sorted(funcs, key=lambda f: (-f["lines"], f["file"], f["line"]))[:10]
    p90 = lengths[max(0, -(-len(lengths) * 9 // 10) - 1)]  # nearest rank
    report = {"rev": args.rev or "working tree", "files": len(units),
              "functions": {"count": len(funcs), "median": statistics.median(lengths), "p90": p90,
                            "max": lengths[-1], "longest": longest},
              "classes": {}, "hand_built_requests": {}}
    for cls in classes:
        defs = [f for f in funcs if f["class"] == cls]
        files = {name: sum(f["lines"] for f in defs if f["file"] == name) for name in sorted({f["file"] for f in defs})}
        declared = set().union(*(u.declared_methods(cls) for u in units))
        report["classes"][cls] = {"definition_lines": sum(f["lines"] for f in defs), "definitions": len(defs),
                                  "declared_methods": len(declared), "files": files}
    for u in units:
        if lines := hand_built(u):
            report["hand_built_requests"][u.name] = lines
    if args.json:
        json.dump(report, sys.stdout, indent=2); print(); return
    fr = report["functions"]
    print(f"rev: {report['rev']}, {report['files']} files\n\nFunction definitions: {fr['count']},"
          f" lines: median {fr['median']:g}, p90 {fr['p90']}, max {fr['max']}")
    for f in longest:
        print(f"  {f['lines']:5}  {f['file']}:{f['line']}  {f['name']}")
    print("\nClasses (lines of member function definitions; methods declared in the class body):")
    for cls, c in report["classes"].items():
        print(f"  {cls}: {c['definition_lines']} lines in {c['definitions']} definitions over {len(c['files'])} files;"
              f" {c['declared_methods']} methods declared")
        for name, n in c["files"].items():
            print(f"    {n:5}  {name}")
    counts = report["hand_built_requests"]
    print(f"\nHand-built proto::Request: {sum(len(v) for v in counts.values())}")
    for name, lines in counts.items():
        print(f"  {len(lines):5}  {name}")


if __name__ == "__main__":
    main()
