"""The session's helper process (runs there; in the kernel only with
``--session kernel``): the session host (monitor, records, views, memory
warning, black box), its main loop, and what it and the kernel say to each
other (:mod:`.protocol`)."""
