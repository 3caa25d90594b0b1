import os

from hypothesis import HealthCheck, settings

# Property tests: no per-example deadline (torch's first calls are slow); a CI profile with
# fewer examples keeps the suite well inside its time, GATHERLENS_HYPOTHESIS=thorough for more.
settings.register_profile(
    "default", deadline=None, max_examples=40,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "thorough", deadline=None, max_examples=400,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("GATHERLENS_HYPOTHESIS", "default"))
