//! The undo list of an ADD (the bridge plugin's model, shared by the interface plugins): each step that changed
//! something registers how to take it back; when a later step fails, the registered undos run in reverse order.

use crate::spec::Result;

type Step<'a> = Box<dyn FnOnce() -> Result<()> + 'a>;

#[derive(Default)]
pub struct Undo<'a> {
    steps: Vec<(String, Step<'a>)>,
}

impl<'a> Undo<'a> {
    /// Registers how to undo the step just done.
    pub fn push(&mut self, what: impl Into<String>, undo: impl FnOnce() -> Result<()> + 'a) {
        self.steps.push((what.into(), Box::new(undo)));
    }

    /// Runs every undo, newest first. An undo that fails is reported on stderr and the others still run:
    /// the error the caller returns is the one that caused the rollback.
    pub fn rollback(mut self) {
        while let Some((what, undo)) = self.steps.pop() {
            crate::spec::report_rollback(what, undo());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    #[test]
    fn runs_in_reverse_and_continues_after_errors() {
        let log = RefCell::new(Vec::new());
        let mut undo = Undo::default();
        undo.push("a", || {
            log.borrow_mut().push("a");
            Ok(())
        });
        undo.push("b", || {
            log.borrow_mut().push("b");
            Err(crate::spec::Error::internal("b failed"))
        });
        undo.push("c", || {
            log.borrow_mut().push("c");
            Ok(())
        });
        undo.rollback();
        assert_eq!(*log.borrow(), vec!["c", "b", "a"]);
    }
}
