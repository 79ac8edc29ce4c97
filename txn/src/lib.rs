pub mod history;
pub mod object;
pub mod records;
pub mod regions;
pub mod ring;
