"""Planning: what a `loopeval run` asks for (`spec`, `sweep`, the options table `options`) and the runs it plans
(`plan`), all checked before anything is loaded or written."""
