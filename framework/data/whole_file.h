// Files written whole or not at all: PATH.partial, renamed into place once every byte is written
// and the file closed, so that a reader (a viewer, the run report, a stopped job's user) never
// sees half a file, and a failure leaves nothing behind (the partial is removed).
#pragma once

#include <functional>
#include <string>

namespace tessera::data {

// `write(partial)` writes the file at `partial` and returns false on failure (an exception from
// it also removes the partial). Throws UserError naming `what` and `path` on any failure.
void write_whole_file_with(const std::string& path, const std::string& what,
                           const std::function<bool(const std::string& partial)>& write);

// `bytes` as the file `path`, every write and the close checked; UserError as above.
void write_whole_file(const std::string& path, const std::string& bytes, const std::string& what);

}  // namespace tessera::data
