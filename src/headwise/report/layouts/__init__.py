"""Report layouts, one module per study kind; each registers itself with
:func:`headwise.report.registry.register_layout`, and every module here is imported when a kind
is first looked up."""
