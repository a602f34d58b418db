"""The conformance vector files of ``spec/vectors`` (``ring-ref vectors [--ops|--presets|...] --out DIR``).

One module per file family, each with its constants (``JSON_NAME``,
``SCHEMA_NAME``, ``VERSION``, ``SEED``, ``NOTES``, ``HEADER``, ``COMMAND``),
``build()``, ``schema()``, ``contents()`` and ``write()``:

* ``_sums``: the v1 vectors of ``sum`` (``ring_all_reduce_v1.json``, its schema and its text twin);
* ``_ops``: the other reduction ops of ``spec/operations.md`` (``ring_all_reduce_ops_v1.json``);
* ``_presets``: the schedule presets of ``spec/schedules.md`` (``ring_all_reduce_presets_v1.json``).
* ``_collectives``: reduce-scatter and all-gather alone, ``spec/reduce_scatter_all_gather.md``
  (``ring_reduce_scatter_v1.json``, ``ring_all_gather_v1.json``).

What they share (the document envelope, the schema builders, a test's object
with its round buffers, seeded inputs, deterministic JSON and writing the
files) is ``_format``.
"""
