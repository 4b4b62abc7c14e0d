// The C functions behind kiln_api's version-2 tensor slots: a session's live parameters,
// buffers and optimizer state handed out as DLPack views (no copies), and weights loaded into
// the model from DLPack tensors.
#pragma once

#include "kiln/kiln.h"

namespace kiln::capi {

kiln_status* session_tensors(kiln_session* session, uint32_t kinds, kiln_tensor_list** out);
size_t tensor_list_count(const kiln_tensor_list* list);
const char* tensor_list_name(const kiln_tensor_list* list, size_t index);
kiln_status* tensor_list_get(const kiln_tensor_list* list, size_t index, DLManagedTensor** out);
void tensor_list_release(kiln_tensor_list* list);
kiln_status* session_load_tensors(kiln_session* session, const char* const* names,
                                  const DLManagedTensor* const* tensors, size_t count,
                                  uint32_t flags);

}  // namespace kiln::capi
