"""Use cases written once, called by every face (HTTP routers, CLI): faces parse, call one operation here,
and render; operations call the stores (registry, indexes, jobs, encoders, vectordb) and align.

- :mod:`.maps`      fit a map (validate → fit → diagnostics → report → register), spaces, map summaries,
                    fit reports
- :mod:`.embeddings`  texts into vectors: the sides of a fit, and embeddings translated through the maps
                    (the registry's path, or a pinned one)
- :mod:`.steers`    fit and register a steer, apply, lens, alias, delete, transfer through a map
- :mod:`.steer_apply`  eps checks and steered queries (searches, generation), re-exported by :mod:`.steers`
- :mod:`.jobs`      submit a background job (idempotently), list, follow, cancel
- :mod:`.plans`     plan a migration before the fit, fit a migration map, the retention gate
- :mod:`.vectordb`  move a vector-database collection through a map; checkpoint status; verify

Long operations take a :data:`service.progress.Progress` (``progress(stage, fraction)``).
"""
