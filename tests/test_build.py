def test_extension_imports():
    from dicomm import _C
    assert _C.__doc__
