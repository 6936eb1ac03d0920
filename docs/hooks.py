"""MkDocs hooks.

- The configuration reference is filled from the schema at build time, so it is never written by
  hand (``rollwise.config_doc.reference_markdown``).
- The method specifications are copies kept unchanged; their evidence tags written side by side
  (``[PAPER] [CODE]``) would read as a reference-style link, so the second bracket is escaped.
"""

import re

MARKER = "<!-- rollwise:config-reference -->"


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri.startswith("specs/"):
        markdown = re.sub(r"\] \[", r"] \\[", markdown)
    if MARKER not in markdown:
        return markdown
    from rollwise.config_doc import reference_markdown

    return markdown.replace(MARKER, reference_markdown())
