# SPDX-License-Identifier: MIT
# Where make install put libulpack.so (rewritten there); None in the source tree.
LIBPATH = None
