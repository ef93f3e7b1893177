#!/usr/bin/env python3
"""tiermemd.toml(5) from config/tiermemd.toml, the shipped example that
documents every key (tests/daemon/config_test.cpp checks it names every key
the daemon reads): its opening comment is the DESCRIPTION, each [table] a
subsection, each key with the comment above it and its default an entry.
Usage: toml_man.py EXAMPLE VERSION > tiermemd.toml.5"""
import re
import sys


def esc(text):
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\\&" + text if text[:1] in (".", "'") else text


def main():
    path, version = sys.argv[1], sys.argv[2]
    lines = open(path, encoding="utf-8").read().splitlines()
    out = [f'.TH TIERMEMD.TOML 5 "" "tiermem {version}" "tiermem"',
           ".SH NAME", "tiermemd.toml \\- configuration of tiermemd(8)", ".SH DESCRIPTION"]
    i = 0
    while i < len(lines) and lines[i].startswith("#"):  # the file's opening comment
        out.append(esc(lines[i].lstrip("# ").rstrip()))
        i += 1
    out += [".PP", "Tables and keys follow, each key with its default.", ".SH KEYS"]
    comment = []
    for line in lines[i:]:
        s = line.strip()
        if not s:
            comment = []
            continue
        if s.startswith("#"):
            comment.append(s.lstrip("#").strip())
            continue
        table = re.match(r"^\[\[?([^\]]+)\]\]?$", s)
        if table:
            out.append(".SS [" + esc(table.group(1)) + "]")
            if comment:
                out.append(esc(" ".join(comment)))
            comment = []
            continue
        key = re.match(r"^([A-Za-z0-9_.]+)\s*=\s*(.*)$", s)
        if key:
            out.append(".TP")
            out.append("\\fB" + esc(key.group(1)) + "\\fR = " + esc(key.group(2)))
            out.append(esc(" ".join(comment)) if comment else "(as above)")
            comment = []
    out += [".SH FILES", "/etc/tiermem/tiermemd.toml", ".SH SEE ALSO", ".BR tiermemd (8),", ".BR tiermemctl (8)"]
    print("\n".join(out))


main()
