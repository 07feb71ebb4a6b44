// The 16-hex-digit form of a dataset fingerprint (data::Dataset::fingerprint), shared by the
// dataset readers so that every kind of dataset prints it alike.
#pragma once

#include <cstdio>
#include <string>

#include "distributed/agreement.h"

namespace tessera::data {

// distributed::fingerprint (FNV-1a) of `text` as 16 lowercase hex digits.
inline std::string fingerprint_hex(const std::string& text) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx",
                static_cast<unsigned long long>(distributed::fingerprint(text)));
  return hex;
}

}  // namespace tessera::data
