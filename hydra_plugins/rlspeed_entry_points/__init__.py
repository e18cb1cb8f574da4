"""The options other packages add through entry points (``rlspeed.registry``), as options of
rlspeed's config groups: ``rlspeed algo=<plug-in>`` composes with no YAML anywhere."""
