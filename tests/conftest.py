import os

from hypothesis import settings

# CI runs more examples than a quick local run; both are deterministic per seed.
settings.register_profile("default", max_examples=200, deadline=None)
settings.register_profile("regress", max_examples=2000, deadline=None)
settings.load_profile("regress" if os.environ.get("SFNPU_REGRESS") else "default")
