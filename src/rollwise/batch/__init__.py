"""The batch stage: D3S's selection of the rows to train (``d3s.py``). The batch is built by
``rollwise.batches`` and laid out by ``rollwise.collate`` (the ground floor, shared with the stages that
score rows)."""
