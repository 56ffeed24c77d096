#!/usr/bin/env python3
"""scripts/check-docs.py reports what a page points at that is not there.

Builds a small tree with one page of good references and one with a broken
link, a broken anchor, a missing file in a code span, and a template span
that must not count; the checker passes the first and names exactly the
three broken references of the second.
"""
import os
import subprocess
import sys
import tempfile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
CHECKER = os.path.join(ROOT, "scripts", "check-docs.py")


def run(root):
    p = subprocess.run([sys.executable, CHECKER, root], capture_output=True, text=True)
    return p.returncode, p.stdout.splitlines()


def write(root, path, text):
    full = os.path.join(root, path)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "w", encoding="utf-8") as f:
        f.write(text)


def main():
    with tempfile.TemporaryDirectory() as root:
        write(root, "server/shard/real.cc", "// a source file\n")
        write(root, "docs/other.md", "# Other page\n\n## A section: with (punctuation)\n")
        write(root, "docs/good.md",
              "# Good\n\nSee [the other page](other.md), its "
              "[section](other.md#a-section-with-punctuation), [here](#good),\n"
              "`server/shard/real.cc ~12`, `server/shard/real.cc:40`, "
              "`server/shard/<name>.cc` and [the web](https://example.com).\n"
              "```\nserver/in/a/fence.cc [x](missing.md)\n```\n")
        code, out = run(root)
        if code != 0:
            print("good references were reported:", *out, sep="\n  ")
            return 1
        write(root, "docs/bad.md",
              "# Bad\n\n[gone](gone.md)\n[no anchor](other.md#no-such-heading)\n"
              "`server/shard/missing.cc`\n")
        code, out = run(root)
        want = ["docs/bad.md:3: link to gone.md: no such file",
                "docs/bad.md:4: link to other.md#no-such-heading: no heading with that anchor",
                "docs/bad.md:5: `server/shard/missing.cc`: no such file in the repository"]
        if code != 1 or out != want:
            print(f"exit {code}, reported:", *out, "wanted:", *want, sep="\n  ")
            return 1
    print("check-docs reports exactly the planted broken references")
    return 0


if __name__ == "__main__":
    sys.exit(main())
