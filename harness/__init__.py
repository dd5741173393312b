"""The harness: RunSpec, runner, LightEval bridge, memory samplers, profiling and the `loopeval` CLI."""
