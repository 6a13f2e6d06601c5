"""Config: the typed group schemas Hydra composes with, cross-field checks, the command line's pre-flight and help."""

from lab.config.hydra_schemas import register_schemas

register_schemas()  # before any compose: conf/<group>/*.yaml name `schema` in their defaults
