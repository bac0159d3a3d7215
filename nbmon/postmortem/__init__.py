"""Why did my kernel die: the black box that outlives a kernel
(:mod:`.blackbox`), the warning before a container's memory limit
(:mod:`.memwarn`), and the post-mortem read from a dead kernel's box
(:mod:`.deaths`)."""
