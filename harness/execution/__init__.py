"""Execution: planned runs stored, then run by an executor (`executor`: in this process and its workers, `local` and
`pool`, or one Ray task per run, `ray_executor`), each through `runner` with its measurements written as they happen
(`recorder`)."""
