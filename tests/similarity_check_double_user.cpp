// check_similarity on double, the user's similarities (extension_support.hpp says why here).
#include "extension_support.hpp"

namespace test::ext {
template void check_similarity_of<double, false>(const similarity_case&);
}  // namespace test::ext
