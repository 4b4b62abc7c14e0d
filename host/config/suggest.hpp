// Nearest-name suggestions for "did you mean" messages.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace kiln::config {

// Optimal-string-alignment distance: insertions, deletions, substitutions and swaps of two
// adjacent characters each cost 1.
std::size_t edit_distance(const std::string& a, const std::string& b);

// The candidate closest to `word`, accepted when its distance is <= max(2, word.size() / 3);
// ties go to the earlier candidate. nullopt when nothing is close enough.
std::optional<std::string> nearest(const std::string& word,
                                   const std::vector<std::string>& candidates);

}  // namespace kiln::config
