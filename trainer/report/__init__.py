"""What people read: the HTML report and the console."""
