// check_similarity on float, the built-in similarities (extension_support.hpp says why here).
#include "extension_support.hpp"

namespace test::ext {
template void check_similarity_of<float, true>(const similarity_case&);
}  // namespace test::ext
