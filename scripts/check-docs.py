#!/usr/bin/env python3
"""Fails when a page of the docs points at something that does not exist.

Checks every Markdown file of the repository (README.md, docs/, deploy/,
bench/, client/, ... ; not build trees or fetched copies):

- relative links `[text](path)` and `[text](path#anchor)`: the file exists,
  and the anchor is a heading of it (GitHub's anchors: lower case, spaces to
  dashes, punctuation dropped);
- `#anchor` links within the page;
- file paths in code spans, such as `server/shard/shard_server.cc` or
  `deploy/k8s/base/shards.yaml ~40`: a span that starts with one of the
  repository's top-level source folders and names a file with an extension
  (or a folder ending in /) must exist. Spans with placeholders (<...>, *,
  {...}, $) are templates, not paths, and are skipped.

Usage: scripts/check-docs.py [ROOT] (default: the repository holding this
script). Exit 0 when everything resolves, 1 with one line per broken
reference otherwise (file:line: what).
"""
import os
import re
import sys

SKIP_DIRS = {".git", "node_modules", "third_party"}
# Top-level folders whose files the docs name in code spans.
SOURCE_DIRS = ("bench/", "client/", "common/", "deploy/", "docs/", "examples/",
               "kernels/", "proto/", "scripts/", "server/", "tests/", "worker/",
               ".ci/")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")


def anchor_of(heading):
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"`([^`]*)`", r"\1", heading)  # code spans keep their text
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # links keep theirs
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path, cache={}):
    if path not in cache:
        found, seen = set(), {}
        in_fence = False
        with open(path, encoding="utf-8") as f:
            for line in f:
                if FENCE.match(line):
                    in_fence = not in_fence
                    continue
                m = None if in_fence else HEADING.match(line)
                if not m:
                    continue
                base = anchor_of(m.group(2))
                n = seen.get(base, 0)
                seen[base] = n + 1
                found.add(base if n == 0 else f"{base}-{n}")
        cache[path] = found
    return cache[path]


def markdown_files(root):
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        top = rel.split(os.sep)[0]
        dirnames[:] = [d for d in dirnames
                       if d not in SKIP_DIRS and not (rel == "." and d.startswith("build"))]
        if top.startswith("build") and rel != ".":
            continue
        for name in filenames:
            if name.endswith(".md"):
                yield os.path.join(dirpath, name)


def span_path(span):
    """The repository path a code span names, or None."""
    token = span.strip().split()[0] if span.strip() else ""
    token = re.sub(r"[:~]\d+(-\d+)?$", "", token)  # file:line, file~line
    token = token.rstrip(".,;:)")
    if not token.startswith(SOURCE_DIRS):
        return None
    if re.search(r"[<>*{}$|\[\]]", token):
        return None
    last = token.rstrip("/").rsplit("/", 1)[-1]
    if not token.endswith("/") and "." not in last:
        return None  # a binary or a folder without its slash: not checked
    return token


def check_file(root, path):
    errors = []
    here = os.path.dirname(path)
    rel = os.path.relpath(path, root)
    in_fence = False
    with open(path, encoding="utf-8") as f:
        lines = f.readlines()
    for number, line in enumerate(lines, 1):
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        for target in LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, mailto:, ...
                continue
            file_part, _, anchor = target.partition("#")
            dest = path if not file_part else os.path.normpath(os.path.join(here, file_part))
            if not os.path.exists(dest):
                errors.append(f"{rel}:{number}: link to {target}: no such file")
                continue
            if anchor and dest.endswith(".md") and anchor not in anchors(dest):
                errors.append(f"{rel}:{number}: link to {target}: no heading with that anchor")
        for span in CODE_SPAN.findall(line):
            target = span_path(span)
            if target and not os.path.exists(os.path.join(root, target)):
                errors.append(f"{rel}:{number}: `{span}`: no such file in the repository")
    return errors


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(__file__), ".."))
    errors = []
    for path in sorted(markdown_files(root)):
        errors.extend(check_file(root, path))
    for e in errors:
        print(e)
    if errors:
        print(f"{len(errors)} broken reference(s) in the docs", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
