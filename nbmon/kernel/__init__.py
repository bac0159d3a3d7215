"""The kernel's side (runs in the user's kernel): the magics and cell hooks,
the session's handle and its pipe to the helper, and the survey of the
user's variables (which needs the user's objects)."""
