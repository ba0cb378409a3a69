import pytest
import torch
import torch._dynamo


@pytest.fixture
def fresh_dynamo():
    """Each compiling test starts and ends with Dynamo's caches empty (no guard churn across tests)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
