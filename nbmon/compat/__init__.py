"""The two APIs nbmon was specified from, verbatim, on nbmon's engine (runs
in the caller's process: a script's, or the kernel's): calibrax's
``ResourceMonitor`` (:mod:`.calibrax`) and scaffold's ``SystemMonitor``
(:mod:`.scaffold`)."""
