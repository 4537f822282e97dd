#!/usr/bin/env python3
"""Check the relative links of README.md and docs/ (docs/notebook/ excepted:
it is a dated record and keeps the names of its day).

For every markdown link or image `[text](target)` whose target is not a URL,
the target file must exist relative to the page, and a `#anchor` must be the
GitHub slug of a heading of the target page (or of the page itself for a
bare `#anchor`). Code spans and fenced code blocks are skipped. Prints each
broken link as `page:line: target: why` and exits 1 if there is any.

Run from anywhere: python3 docs/check-links.py
"""

import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")


def pages():
    yield os.path.join(ROOT, "README.md")
    docs = os.path.join(ROOT, "docs")
    for folder, dirs, files in os.walk(docs):
        dirs[:] = sorted(d for d in dirs if os.path.join(folder, d) != os.path.join(docs, "notebook"))
        for name in sorted(files):
            if name.endswith(".md"):
                yield os.path.join(folder, name)


def lines_outside_code(path):
    """(line number, text) of the lines outside fenced code blocks."""
    fenced = None
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            m = FENCE.match(line)
            if m:
                if fenced is None:
                    fenced = m.group(1)
                elif fenced == m.group(1):
                    fenced = None
                continue
            if fenced is None:
                yield number, line.rstrip("\n")


def strip_code_spans(text):
    return re.sub(r"(`+)(?:(?!\1).)+?\1", lambda m: " " * len(m.group(0)), text)


def slug(heading):
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation
    other than '-' and '_' removed, each space a '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links keep their text
    text = re.sub(r"<[^>]+>", "", text)  # inline html
    text = text.replace("`", "").replace("*", "")
    text = text.lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


_anchors = {}


def anchors(path):
    if path not in _anchors:
        seen = {}
        found = set()
        for _, line in lines_outside_code(path):
            m = HEADING.match(line)
            if not m:
                continue
            base = slug(m.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
        _anchors[path] = found
    return _anchors[path]


def main():
    broken = []
    checked = 0
    for page in pages():
        rel_page = os.path.relpath(page, ROOT)
        for number, line in lines_outside_code(page):
            for m in LINK.finditer(strip_code_spans(line)):
                target = m.group(1)
                if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, mailto:, ...
                    continue
                checked += 1
                file_part, _, anchor = target.partition("#")
                path = page if not file_part else os.path.normpath(os.path.join(os.path.dirname(page), file_part))
                if not os.path.exists(path):
                    broken.append(f"{rel_page}:{number}: {target}: no such file")
                    continue
                if anchor:
                    if not path.endswith(".md") or os.path.isdir(path):
                        broken.append(f"{rel_page}:{number}: {target}: anchor on a file that is not markdown")
                    elif anchor not in anchors(path):
                        broken.append(f"{rel_page}:{number}: {target}: no heading with this anchor")
    for line in broken:
        print(line)
    print(f"{checked} relative links checked, {len(broken)} broken")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
