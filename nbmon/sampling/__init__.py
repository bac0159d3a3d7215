"""The sampling core: a sampler reads the sources on a schedule (a thread,
:mod:`.sampler`, or a helper process, :mod:`.process`) into the bounded
columnar store (:mod:`.store`); what a source or consumer fails at is counted
(:mod:`.faults`), never raised into the watched program."""
