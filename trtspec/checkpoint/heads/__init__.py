"""One loader per published draft-head format; each returns a DrafterSpec with canonical names."""
