# The type of dtrain/_build_info.py, which CMake writes from python/build_info.py.in when dtrain is
# built (the source tree has no .py of it, so type checkers read this).

# The torch whose C++ headers and libraries the extension was compiled against.
TORCH_VERSION: str
