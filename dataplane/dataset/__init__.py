"""Data sets as content (docs/datasets.md): a job names its data set by digest, never by path.

``content``: the canonical archive of a data set's files and its digest, where this machine holds each digest,
the layout the learner serves it in; ``spec``: the ``data`` object of a ``dataset`` task; ``load``: reading the
files with Hugging Face ``datasets`` into the rows a task samples and scores.
"""
