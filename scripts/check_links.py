#!/usr/bin/env python3
"""Check the relative links of the documentation.

Checks every Markdown link and image in README.md and docs/**/*.md whose target is not a URL:
the file or folder must exist, and an #anchor must name a heading of the target file (GitHub's
rule: lower case, punctuation removed, spaces to hyphens, "-1", "-2" ... for repeated headings).
Links inside code blocks and inline code are ignored.

Usage: python3 scripts/check_links.py [FILE.md ...]
Exits 1 and lists every broken link (file:line: target: why), 0 when all resolve.
Python 3 standard library only.
"""
import pathlib
import re
import sys
import urllib.parse

ROOT = pathlib.Path(__file__).resolve().parent.parent
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")


def strip_code(lines):
    """The lines with fenced blocks blanked and inline code removed."""
    out, fenced = [], False
    for line in lines:
        if FENCE.match(line):
            fenced = not fenced
            out.append("")
            continue
        out.append("" if fenced else re.sub(r"`[^`]*`", "", line))
    return out


def slug(text):
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"<[^>]+>", "", text)                  # inline HTML
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # links keep their text
    text = text.replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)                 # punctuation goes, letters stay
    return text.replace(" ", "-")


_anchors = {}


def anchors(path):
    if path not in _anchors:
        seen, found, fenced = {}, set(), False
        for line in path.read_text(encoding="utf-8").splitlines():
            if FENCE.match(line):
                fenced = not fenced
                continue
            m = None if fenced else HEADING.match(line)
            if m:
                base = slug(m.group(2))
                n = seen.get(base, 0)
                seen[base] = n + 1
                found.add(base if n == 0 else f"{base}-{n}")
        for m in re.finditer(r'<a\s+(?:name|id)="([^"]+)"', path.read_text(encoding="utf-8")):
            found.add(m.group(1))
        _anchors[path] = found
    return _anchors[path]


def check(md):
    errors = []
    lines = strip_code(md.read_text(encoding="utf-8").splitlines())
    for lineno, line in enumerate(lines, 1):
        for m in LINK.finditer(line):
            target = m.group(1)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
                continue
            path_part, _, anchor = target.partition("#")
            path_part = urllib.parse.unquote(path_part)
            dest = md if not path_part else (md.parent / path_part).resolve()
            where = f"{md.relative_to(ROOT)}:{lineno}: {target}"
            if not dest.exists():
                errors.append(f"{where}: no such file")
                continue
            if anchor:
                if dest.is_dir() or dest.suffix.lower() != ".md":
                    errors.append(f"{where}: an anchor into a file that is not Markdown")
                elif urllib.parse.unquote(anchor) not in anchors(dest):
                    errors.append(f"{where}: no heading with anchor #{anchor} in "
                                  f"{dest.relative_to(ROOT)}")
    return errors


def main(argv):
    if argv:
        files = [pathlib.Path(a).resolve() for a in argv]
    else:
        files = [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))
    errors = []
    for md in files:
        errors += check(md)
    for e in errors:
        print(e)
    print(f"{len(files)} files, {len(errors)} broken links" if errors
          else f"{len(files)} files, all relative links resolve")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
