"""LightEval task configs and bundled data. Imports lighteval only, never adapters or db."""
