"""Built-in environments. Each submodule exposes ``load_environment(**kwargs)``."""
