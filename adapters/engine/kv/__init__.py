"""Where a token's K/V live and what they cost: the policies' names, the layouts, the byte format, the caches.

Nothing here imports the model or the families: a config's layout is `layouts.layout_of`, and the caches and the
paged pool are handed it by whoever builds them (docs/architecture.md, "The engine's files").
"""
