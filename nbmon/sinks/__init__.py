"""Where samples go besides the store: the consumer thread that feeds them
(:mod:`.consumers`), the built-in senders -- CSV, JSON Lines, a callback --
and the table of sinks that the magics, the CLI, ``nbmon.monitor()`` and the
seed APIs take their output flags from (:mod:`.senders`), and files made
safely in shared folders (:mod:`.files`)."""
