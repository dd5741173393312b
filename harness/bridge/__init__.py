"""The LightEval bridge: any adapter as the model LightEval's Pipeline calls (`lighteval_model`, with its two
generation modes in `generation` and choice ranking in `choices`), the Pipeline run on a run's tasks and its scores
read back (`evaluation`), and what finished samples hand on (`records`, importable without LightEval)."""
