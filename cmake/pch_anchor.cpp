// Anchor translation unit for the shared torch precompiled header.
