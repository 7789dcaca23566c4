// A full capture's part file written in C++ (the layout of part_file.py: 8-byte header length, a
// JSON header naming each storage's offset and size and each record's payload under its key, then
// each storage's bytes once, 64-byte aligned), from records the observer kept, on the index
// writer's thread.
#pragma once

#include <string>
#include <vector>

#include "op_record.h"

namespace ditorch_precision {

// Writes the payloads of `records` (each with its key set) to `path`; raises std::runtime_error
// naming the file and the failure.
void write_part(const std::string& path, const std::vector<const Record*>& records, const DtypeNames& dtype_name);

}  // namespace ditorch_precision
