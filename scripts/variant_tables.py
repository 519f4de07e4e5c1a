"""Writes the variant table, `keras_cait.models.variants.markdown_table()`, into README.md and docs/weights.md.

    python scripts/variant_tables.py

The table is made from `VARIANTS` and the checkpoint registry; each page holds a copy between
`<!-- variants:start -->` and `<!-- variants:end -->`, which this script replaces.
tests/models/test_variants.py fails while a copy differs from the table.
"""

import pathlib
import re

from keras_cait.models.variants import markdown_table

REPOSITORY = pathlib.Path(__file__).resolve().parent.parent
PAGES = ("README.md", "docs/weights.md")
BLOCK = re.compile(r"(<!-- variants:start -->\n).*?(\n<!-- variants:end -->)", re.S)


def main():
    for page in PAGES:
        path = REPOSITORY / page
        text = path.read_text(encoding="utf-8")
        if not BLOCK.search(text):
            raise SystemExit(f"{page}: no <!-- variants:start --> ... <!-- variants:end --> block to write into")
        path.write_text(BLOCK.sub(lambda found: found.group(1) + markdown_table() + found.group(2), text),
                        encoding="utf-8")
        print(f"wrote the variant table into {page}")


if __name__ == "__main__":
    main()
