//! The undo list of an ADD, shared by every plugin: see [`cnicore::undo`].

pub use cnicore::undo::Undo;
