"""Check that every relative link in README.md and docs/*.md resolves.

A link `[text](path)` must name an existing file (relative to the file it appears in), and
`[text](path#anchor)` or `[text](#anchor)` a heading of that file, with GitHub's anchor rule
(lower case; punctuation other than `-` and `_` dropped; spaces become `-`; a repeated
heading gets `-1`, `-2`, ...). Headings inside fenced code blocks do not count. External links
(http, https, mailto) are not checked. Exit code 1 and one line per broken link otherwise.

    python scripts/check_doc_links.py
"""
import glob
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def slug(heading):
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def anchors(path):
    seen, out, fence = {}, set(), False
    for line in open(path, encoding="utf-8"):
        if line.lstrip().startswith("```"):
            fence = not fence
            continue
        m = None if fence else re.match(r"^#{1,6} (.*?)\s*#*\s*$", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(path):
    fence = False
    for i, line in enumerate(open(path, encoding="utf-8"), 1):
        if line.lstrip().startswith("```"):
            fence = not fence
            continue
        if fence:
            continue
        line = re.sub(r"`[^`]*`", "", line)  # links are never inside inline code
        for m in re.finditer(r"\]\(([^)\s]+)\)", line):
            yield i, m.group(1)


def main():
    files = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
    bad = 0
    for f in files:
        for lineno, target in links(f):
            if re.match(r"^(https?|mailto):", target):
                continue
            path, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(f), path)) if path else f
            where = f"{os.path.relpath(f, ROOT)}:{lineno}: {target}"
            if not os.path.exists(dest):
                print(f"{where}: no such file")
                bad += 1
            elif anchor and (not dest.endswith(".md") or anchor not in anchors(dest)):
                print(f"{where}: no such anchor")
                bad += 1
    print(f"{bad} broken link(s) in {len(files)} files" if bad else f"all links resolve ({len(files)} files)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
