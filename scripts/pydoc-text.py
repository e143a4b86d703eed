#!/usr/bin/env python3
"""Writes a real English text for perplexity runs: the documentation topics
that ship with Python (pydoc_data.topics), every topic in sorted order, so
every machine with the same Python has the same text; nothing is committed
or fetched. Prints the text's size and a short hash of it.

    scripts/pydoc-text.py OUT.txt [--chars N]
"""

import hashlib
import sys

from pydoc_data.topics import topics


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    text = "\n\n".join(topics[k].strip() for k in sorted(topics)) + "\n"
    if "--chars" in sys.argv:
        text = text[: int(sys.argv[sys.argv.index("--chars") + 1])]
    with open(sys.argv[1], "w", encoding="utf-8") as f:
        f.write(text)
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    print(f"{sys.argv[1]}: {len(text)} characters of pydoc_data.topics (Python "
          f"{sys.version.split()[0]}), sha256 {digest}")


if __name__ == "__main__":
    main()
